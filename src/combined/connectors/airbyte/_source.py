"""The airbyte source: any Airbyte-protocol source connector, run as a child process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from combined.connectors._shared import select_plans
from combined.connectors._subprocess._live import CONFIG_FILE
from combined.connectors._subprocess._private import PrivateDir
from combined.connectors._subprocess._process import ChildProcess, LineTooLong
from combined.connectors._subprocess._rows import decode_line
from combined.connectors._subprocess._run import call, check_request, refuse_lookback
from combined.connectors._subprocess._source import ProgramSource
from combined.connectors.abc import Discovery, Extraction, ReadRequest
from combined.connectors.airbyte._catalog import (
    Stream,
    configured_catalog,
    describe,
    field_plans,
    find_stream,
    parse_catalog,
)
from combined.connectors.airbyte._messages import control, exit_error, failed, log, trace_error
from combined.connectors.airbyte._read import AirbyteExtraction
from combined.connectors.airbyte._settings import CONFIG_KEYS, FLAVOUR, Settings
from combined.errors import ConfigError, SourceError, SourceUnavailable

_RERUN = "run the connector's `{command} --config <file>` yourself to see what it writes"


class AirbyteSource(ProgramSource[Settings]):
    """An Airbyte-protocol source (source-faker, source-github, ...) run as a child process.

    Configuration:

    ``command``
        The connector's executable (a name on PATH or a path), or an argv list:
        ``[python, -m, source_x]``, or ``[docker, run, --rm, -i, -v,
        "{files}:{files}", airbyte/source-x:1.2.3]`` (``{files}`` is the run's
        private directory, to mount into the container). A string is one
        executable, never split.
    ``config`` (optional)
        The connector's own configuration. Values may be secret references;
        they are resolved when the connector runs and written to a private
        file (mode 0600, in a 0700 directory) removed when it ends. Only the
        file's path is on the command line.
    ``discover_timeout`` (seconds, default 300)
        How long ``check`` or ``discover`` may take.
    ``idle_timeout`` (seconds, default 600)
        How long a read waits for the connector's next line before stopping it.
    ``batch_rows``, ``batch_bytes`` (default 16 MiB), ``max_line_bytes`` (default 64 MiB)
        Bounds on each batch and on one line of the connector's output.

    Datasets are streams: ``relation`` (or ``stream``) is the stream's name,
    or ``namespace.name``. Strategies: ``snapshot`` (``full_refresh``, no
    state) and ``cursor`` (``incremental``, resuming from the per-stream STATE
    committed with the dataset's last capture).
    """

    name: ClassVar[str] = "airbyte"
    revision: ClassVar[str] = "1"
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = CONFIG_KEYS
    _streams: list[Stream] | None = None

    @classmethod
    def _parse(cls, config: Mapping[str, Any]) -> Settings:
        return Settings.parse(config)

    # -- one-shot commands --------------------------------------------------------------

    def _call(self, command: str, wanted: str) -> tuple[list[dict[str, Any]], ChildProcess]:
        """Run ``command --config C``: the messages of type ``wanted`` it wrote.

        LOG lines and lines that are no message go to the log tail; a TRACE
        ERROR is raised as its classified error; a non-zero exit is a
        ``SourceError``.
        """
        found: list[dict[str, Any]] = []
        doing = {"check": "checking the connection", "discover": "discovering its streams"}

        def on_line(proc: ChildProcess, number: int, line: bytes) -> None:
            try:
                msg = decode_line(line)
            except (UnicodeDecodeError, ValueError):
                msg = None
            if not isinstance(msg, dict):
                proc.log(line.decode("utf-8", errors="replace"))
            elif msg.get("type") == "LOG":
                log(proc, msg)
            elif msg.get("type") == "CONTROL":
                control(proc, msg, self.live)
            elif msg.get("type") == "TRACE":
                error = trace_error(proc, msg, self._scrub, doing.get(command, command))
                if error is not None:
                    raise error
            elif msg.get("type") == wanted:
                found.append(msg)

        def arguments(files: PrivateDir) -> list[str]:
            return [command, "--config", files.write(CONFIG_FILE, self.live.current)]

        timeout = self.settings.discover_timeout
        proc, code = call(
            self.settings,
            self._scrub,
            arguments,
            on_line,
            too_slow=lambda: SourceUnavailable(
                f"the connector's {command} did not finish within {timeout:g} s; it was stopped",
                hint="raise `discover_timeout`, or check the provider it reads",
            ),
            too_long=lambda proc, exc: _too_long(proc, command, exc),
            live=self.live,
        )
        if code != 0:
            raise exit_error(proc, command, code)
        return found, proc

    def check(self) -> None:
        """Run the connector's ``check``: its CONNECTION_STATUS must be SUCCEEDED."""
        found, proc = self._call("check", "CONNECTION_STATUS")
        statuses = [m.get("connectionStatus") for m in found]
        status = statuses[-1] if statuses and isinstance(statuses[-1], Mapping) else None
        if status is None:
            raise failed(
                proc,
                "the connector's check wrote no CONNECTION_STATUS",
                _RERUN.format(command="check"),
            )
        if status.get("status") != "SUCCEEDED":
            said = self._scrub(str(status.get("message") or "no message"))
            raise failed(
                proc,
                f"the connector cannot connect (CONNECTION_STATUS {status.get('status')}): {said}",
                "fix the connector's `config:` (credentials, host, account) in the source's "
                "configuration, then check again",
            )

    def discover(self) -> Discovery:
        """Every stream of the connector's CATALOG, with fields, key and cursor."""
        streams = self._catalog(refresh=True)
        names = [s.name for s in streams]
        return Discovery(
            connector=self.name,
            revision=self.revision,
            datasets=tuple(
                describe(
                    s, s.name if names.count(s.name) == 1 else s.qualified, self.settings.typing
                )
                for s in streams
            ),
        )

    def _catalog(self, *, refresh: bool = False) -> list[Stream]:
        if self._streams is not None and not refresh:
            return self._streams
        found, proc = self._call("discover", "CATALOG")
        if not found:
            raise failed(
                proc,
                "the connector's discover wrote no CATALOG",
                _RERUN.format(command="discover"),
            )
        self._streams = parse_catalog(found[-1].get("catalog"))
        return self._streams

    # -- reading ------------------------------------------------------------------------

    def read(self, request: ReadRequest) -> Extraction:
        """Prepare a read of one stream; the connector runs only once the result is iterated."""
        check_request(FLAVOUR, request)
        stream = find_stream(self._catalog(), request.relation, request.dataset)
        plans = field_plans(stream, self.settings.typing)
        cursor: str | None = None
        if request.strategy == "cursor":
            cursor = self._check_cursor(request, stream)
        elif "full_refresh" not in stream.sync_modes:
            raise ConfigError(
                f"stream {stream.qualified!r} cannot be read whole (full_refresh): the "
                "connector reads it incrementally only",
                hint="use `strategy: cursor` for this dataset",
                dataset=request.dataset,
            )
        select_plans(plans, request, stream.qualified, noun="stream")
        strategy: Literal["snapshot", "cursor"] = (
            "cursor" if request.strategy == "cursor" else "snapshot"
        )
        return AirbyteExtraction(
            stream=stream,
            plans=plans,
            catalog=configured_catalog(stream, strategy, cursor, request.key),
            cursor=cursor,
            **self._run_options(request),
        )

    def _check_cursor(self, request: ReadRequest, stream: Stream) -> str:
        spec = self._declared_cursor(request, "cursor field")
        if "incremental" not in stream.sync_modes:
            raise ConfigError(
                f"stream {stream.qualified!r} does not support incremental reads",
                hint="use `strategy: snapshot` for this dataset",
                dataset=request.dataset,
            )
        if stream.source_defined_cursor and spec.column != stream.cursor():
            raise ConfigError(
                f"dataset {request.dataset!r} declares cursor {spec.column!r}, but the "
                f"connector reads stream {stream.qualified!r} incrementally by "
                f"{stream.cursor()!r} (a source-defined cursor)",
                hint=f"set cursor.column to {stream.cursor()}",
                dataset=request.dataset,
            )
        refuse_lookback(FLAVOUR, request)
        return spec.column


def _too_long(proc: ChildProcess, command: str, exc: LineTooLong) -> SourceError:
    return failed(
        proc,
        f"the connector's {command} wrote a line over {exc.limit} bytes",
        "raise `max_line_bytes` if its catalog really is that large",
    )
