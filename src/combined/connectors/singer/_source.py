"""The singer source: any Singer tap, run as a child process."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, ClassVar, Literal

from combined.connectors._shared import select_plans
from combined.connectors._subprocess._live import CONFIG_FILE
from combined.connectors._subprocess._private import PrivateDir
from combined.connectors._subprocess._process import ChildProcess
from combined.connectors._subprocess._run import call, check_request, refuse_lookback, with_log
from combined.connectors._subprocess._source import ProgramSource
from combined.connectors.abc import Discovery, Extraction, ReadRequest
from combined.connectors.singer._catalog import (
    Stream,
    describe,
    field_plans,
    find_stream,
    parse_catalog,
    selected_catalog,
)
from combined.connectors.singer._read import SingerExtraction
from combined.connectors.singer._settings import CONFIG_KEYS, FLAVOUR, Settings, load_json
from combined.errors import ConfigError, NotFoundError, SourceError, SourceUnavailable


def _too_slow(timeout: float) -> SourceUnavailable:
    return SourceUnavailable(
        f"the tap's discovery did not finish within {timeout:g} s; it was stopped",
        hint="raise `discover_timeout`, or give a `catalog:` file",
    )


class SingerSource(ProgramSource[Settings]):
    """A Singer tap (tap-github, tap-stripe, tap-postgres, ...) run as a child process.

    Configuration:

    ``command``
        The tap's executable (a name on PATH or a path), or an argv list
        (``[python, -m, tap_x]``). A string is one executable, never split.
    ``config`` (optional)
        The tap's own configuration. Values may be secret references; they
        are resolved when the tap runs and written, with everything else, to
        a private file (mode 0600, in a 0700 directory) that is removed when
        the tap ends. The file's path is the only thing on the command line.
    ``catalog`` (optional)
        A catalog file to use instead of running the tap's ``--discover``.
    ``discover_timeout`` (seconds, default 300)
        How long discovery may take.
    ``idle_timeout`` (seconds, default 600)
        How long a read waits for the tap's next line before stopping it.
    ``batch_rows``, ``batch_bytes`` (default 16 MiB), ``max_line_bytes`` (default 64 MiB)
        Bounds on each batch and on one line of the tap's output.

    Datasets are streams: ``relation`` (or ``stream``) is the stream's
    ``tap_stream_id``, defaulting to the dataset name. Strategies:
    ``snapshot`` (the tap reads the whole stream, ``FULL_TABLE``, no state)
    and ``cursor`` (``INCREMENTAL`` by the stream's ``replication_key``, the
    tap resuming from the STATE committed with the dataset's last capture).
    """

    name: ClassVar[str] = "singer"
    revision: ClassVar[str] = "1"
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = CONFIG_KEYS
    _streams: list[Stream] | None = None

    @classmethod
    def _parse(cls, config: Mapping[str, Any]) -> Settings:
        return Settings.parse(config)

    # -- discovery ----------------------------------------------------------------------

    def check(self) -> None:
        """Find the tap and read its catalog (its discovery, or the catalog file)."""
        self.settings.executable()
        self._catalog(refresh=True)

    def discover(self) -> Discovery:
        """Every stream of the tap's catalog, with fields, key_properties and replication key."""
        streams = self._catalog(refresh=True)
        return Discovery(
            connector=self.name,
            revision=self.revision,
            datasets=tuple(describe(s, self.settings.typing) for s in streams),
        )

    def _catalog(self, *, refresh: bool = False) -> list[Stream]:
        if self._streams is not None and not refresh:
            return self._streams
        if self.settings.catalog is not None:
            origin = self.settings.catalog
            document = load_json(self.settings.catalog)
        else:
            origin = "the tap's --discover output"
            document = self._run_discovery()
        self._streams = parse_catalog(document, origin)
        return self._streams

    def _run_discovery(self) -> Any:
        chunks: list[bytes] = []

        def arguments(files: PrivateDir) -> list[str]:
            return [
                "--config",
                files.write(CONFIG_FILE, self.live.current),
                "--discover",
            ]

        proc, code = call(
            self.settings,
            self._scrub,
            arguments,
            lambda proc, number, line: chunks.append(line),
            too_slow=lambda: _too_slow(self.settings.discover_timeout),
            too_long=lambda proc, exc: self._failed(
                proc, f"the tap's discovery wrote a line over {exc.limit} bytes"
            ),
            live=self.live,
        )
        if code != 0:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise self._failed(proc, f"the tap's discovery {how}")
        text = b"".join(chunks).decode("utf-8", errors="replace")
        try:
            return json.loads(text, parse_float=Decimal)
        except ValueError as exc:
            raise self._failed(
                proc, f"the tap's discovery printed no valid JSON catalog ({exc})"
            ) from None

    def _failed(self, proc: ChildProcess, message: str) -> SourceError:
        return SourceError(
            with_log(proc, message, "tap"),
            hint="run the tap with --config and --discover yourself to see why; "
            "or give a `catalog:` file",
        )

    # -- reading ------------------------------------------------------------------------

    def read(self, request: ReadRequest) -> Extraction:
        """Prepare a read of one stream; the tap runs only once the result is iterated."""
        check_request(FLAVOUR, request)
        streams = self._catalog()
        stream = find_stream(streams, request.relation)
        if stream is None:
            known = ", ".join(s.tap_stream_id for s in streams) or "none"
            raise NotFoundError(
                f"the tap has no stream {request.relation!r}",
                hint=f"the tap's streams: {known}",
                dataset=request.dataset,
            )
        if request.strategy == "cursor":
            self._check_cursor(request, stream)
        select_plans(
            field_plans(stream, self.settings.typing), request, stream.tap_stream_id, noun="stream"
        )
        columns = None
        if request.columns is not None:
            columns = [*request.columns, *request.key]
            if stream.replication_key:
                columns.append(stream.replication_key)
        strategy: Literal["snapshot", "cursor"] = (
            "cursor" if request.strategy == "cursor" else "snapshot"
        )
        return SingerExtraction(
            stream=stream,
            catalog=selected_catalog(stream, strategy, columns),
            **self._run_options(request),
        )

    def preflight(self, requests: Sequence[ReadRequest]) -> None:
        """Refuse, before any Run, a cursor read of a stream the tap cannot read incrementally."""
        cursors = [r for r in requests if r.strategy == "cursor"]
        streams = self._catalog() if cursors else []
        for request in cursors:
            stream = find_stream(streams, request.relation)
            if stream is not None:
                self._check_cursor(request, stream)

    def _check_cursor(self, request: ReadRequest, stream: Stream) -> None:
        spec = self._declared_cursor(request, "replication_key")
        if stream.replication_key is None:
            raise ConfigError(
                f"dataset {request.dataset!r} reads stream {stream.tap_stream_id!r} by cursor, "
                "but the stream has no replication_key, so the tap cannot read it incrementally",
                hint="use `strategy: snapshot` for this dataset",
                dataset=request.dataset,
            )
        if spec.column != stream.replication_key:
            raise ConfigError(
                f"dataset {request.dataset!r} declares cursor {spec.column!r}, but the tap "
                f"bookmarks stream {stream.tap_stream_id!r} by {stream.replication_key!r}",
                hint=f"set cursor.column to {stream.replication_key}",
                dataset=request.dataset,
            )
        refuse_lookback(FLAVOUR, request)
